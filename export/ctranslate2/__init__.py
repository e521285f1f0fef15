"""A checkpoint as a CTranslate2 model directory (convert.py) and its proof against PyTorch (verify.py)."""
