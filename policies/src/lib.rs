//! `policies`: learning code on candle (filled in by its issue).
