"""The command line: ``cli`` (typer), ``runner`` (files, worker processes, writing),
``verify`` (running a converted script against its original) and ``files`` (reading,
decoding and atomically writing sources). The top layer: nothing imports it."""
