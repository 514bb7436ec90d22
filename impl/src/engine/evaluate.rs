//! Evaluators over a finished conversation, and the result's verdict.
