"""dflash2: DFlash2 block-diffusion speculative decoding for Hugging Face causal LMs."""

__version__ = "0.1.0"
