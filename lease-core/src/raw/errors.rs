//! A look into an error's causes, also inside [`std::io::Error`]s.

/// The first error of type `T` among `error` and its causes. Also looks inside
/// [`std::io::Error`]s, whose `source` skips the error they wrap (TLS libraries report
/// through them).
pub fn find_cause<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(t) = e.downcast_ref::<T>() {
            return Some(t);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            && let Some(t) = find_cause::<T>(inner)
        {
            return Some(t);
        }
        next = e.source();
    }
    None
}

/// The messages of `error` and its causes (also inside [`std::io::Error`]s), joined by
/// `": "`, each one only once.
pub fn error_chain_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut push = |text: String| {
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    };
    let mut next = Some(error);
    while let Some(e) = next {
        push(e.to_string());
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            push(error_chain_text(inner));
        }
        next = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use std::fmt;

    #[test]
    fn causes_are_found_inside_io_errors() {
        #[derive(Debug)]
        struct Inner;
        impl fmt::Display for Inner {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("inner")
            }
        }
        impl std::error::Error for Inner {}
        let io = std::io::Error::other(Inner);
        assert!(find_cause::<Inner>(&io).is_some());
        let plain = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        assert!(find_cause::<Inner>(&plain).is_none());
    }
}
