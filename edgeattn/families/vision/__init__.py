"""The vision family (ViT, DINOv2): its PyTorch model, config section, Hugging Face import, graphs and gate."""
