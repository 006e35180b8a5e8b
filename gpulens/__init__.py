"""gpulens: GPU monitoring that tells busy, idle and data-starved GPUs apart."""

__version__ = "0.1.0"
