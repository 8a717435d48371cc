"""The vision family's torch-free side: its record, graph spec, image decoding and preprocessing,
runtime and command-line part."""
