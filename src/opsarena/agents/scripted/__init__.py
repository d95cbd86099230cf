"""agents/scripted."""
