"""dtlaunch tests."""
