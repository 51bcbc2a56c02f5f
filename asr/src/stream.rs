//! Streaming: to be filled in (voice activity detection and a background transcriber).
