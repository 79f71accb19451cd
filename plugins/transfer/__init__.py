"""Transfer rules: how a trained model's weights cross a recipe change (``seqzoo edit``)."""
