"""The GPU campaign (``bench/gpu_campaign.sh``): what it carries to the GPU machine (``prepare``), the
recipes it trains there through the pipeline's stages (``recipes``), its decoding measure
(``decode``) and the summary of its figures (``summary``). See docs/gpu.md."""
