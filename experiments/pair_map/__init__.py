"""Ground truth for the pair map (`hc.pair_map`) at GPT-2-small size: planted pairs in a random network."""
