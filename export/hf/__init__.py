"""Import Hugging Face translation models (Marian / OPUS-MT, M2M100 / NLLB) into bundles, and verify them
against transformers.
"""
