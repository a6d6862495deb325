"""The core: source text in, converted text and findings out. ``pipeline`` parses once, asks the
analyses for a plan, runs every codemod in one traversal (``composite``, over metadata
resolved once by ``metadata``) and renders once; ``precheck`` is the text scan that lets a
file that cannot train skip all of it; ``result`` holds what a conversion returns."""
