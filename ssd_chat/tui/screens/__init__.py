"""Screens pushed over the chat: loading, help, chats (history), compare, a one-line text prompt."""
