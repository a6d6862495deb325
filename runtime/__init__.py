"""accelify.runtime: helpers that converted scripts may import.

Installed as ``accelify.runtime`` (the folder in the repository is ``runtime/``).
Nothing in it is needed yet: every rewrite so far produces plain Accelerate code.
Later rewrites that need a small helper put it here rather than inline, so that
converted scripts stay short. Importing it never imports torch by itself.
"""

__all__: list[str] = []
