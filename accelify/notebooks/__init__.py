"""The notebook format: ``convert`` turns a .ipynb into one Python text, converts it and maps
the result back to cells; ``launcher`` wraps training code for ``notebook_launcher``."""
