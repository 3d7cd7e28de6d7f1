"""What ranks runs: validation BLEU of the averaged model with the decoding settings chosen on the
validation set (logged by the tune stage). Test scores are shown, never used to rank. Its own light
module, so that ``sweep`` shares it with ``compare`` without loading matplotlib and MLflow."""

RANK_METRIC = "valid_bleu"
