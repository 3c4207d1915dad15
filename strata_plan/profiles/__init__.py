"""Hardware profiles: the versioned schema, its strict loader, and the shipped rigs (*.yaml)."""
