"""The encoder family (BERT, RoBERTa, DistilBERT): its PyTorch model, Hugging Face import and graphs."""
