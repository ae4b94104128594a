"""``python -m workers.cli``: the ``durable`` command (supervised worker processes run this way)."""

from workers.cli import main

main()
