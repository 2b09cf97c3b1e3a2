"""Rich renderables for the console: failure reports, check tables, status."""
