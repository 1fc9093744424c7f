"""Sampling from vLLM: `client` sends one token-in/token-out request and parses the reply, `fleet` spreads
requests over the servers (least outstanding, health checks, retries until the request's deadline, staleness),
`backoff` spaces a request's retries, `chat_tokens` builds the exact token ids of a conversation in the chat
template."""
