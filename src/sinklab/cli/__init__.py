"""Command line interface: ``sinklab measure | fetch | list | train | sweep | report``."""
