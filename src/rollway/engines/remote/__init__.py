"""Engines that are servers elsewhere: SGLang (``sglang``), vLLM (``vllm``) and any
OpenAI-compatible chat API (``openai_chat``), all over one connection rule
(``connection.RemoteClient``), their wire formats and streams beside them; ``router`` spreads
rollouts over a fleet of them and keeps its weights in step."""
