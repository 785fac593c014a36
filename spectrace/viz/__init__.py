"""Views of traces and runs. `core` never imports this package."""
