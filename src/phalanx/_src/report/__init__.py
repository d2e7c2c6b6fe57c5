"""Implementation; import from the public faces instead."""
