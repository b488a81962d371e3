//! Placeholder: this backend is built in a later step.
