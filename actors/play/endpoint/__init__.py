"""The actor's OpenAI-compatible endpoint: `server` (routes, replies, errors), `chat_format` (requests, ChatML
rendering, tool calls), `episode` (one episode's exact tokens across calls), `session` (playing one episode
there, with its failures counted), `metrics`."""
