"""A model's text: chat templates (the model's own, built-in ones, a plain fallback) and
its tokenizer as a Hugging Face directory (`relaykv tokenizer export`)."""
