"""Thin gRPC handlers: convert, call the shard, convert back. Errors are mapped by the interceptor."""
