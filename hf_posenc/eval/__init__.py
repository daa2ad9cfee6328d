"""Long-context evaluation: perplexity against length and passkey retrieval, with accelerate."""
