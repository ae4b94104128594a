"""The process side of durable: workers, the scheduler and the ``durable`` command."""
