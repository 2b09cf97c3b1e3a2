"""The supervisor: the `dtlaunch run` process that owns a job (see DESIGN.md)."""
