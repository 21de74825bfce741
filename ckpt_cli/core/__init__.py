"""The ckpt library: layout discovery, metadata, array access. Never prints, prompts or exits."""
