"""Sans-I/O codecs: framing, serialization, compression. No asyncio, no sockets."""
