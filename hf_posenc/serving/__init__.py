"""What serving engines (vLLM, SGLang, TGI, llama.cpp) build from a patched config."""
