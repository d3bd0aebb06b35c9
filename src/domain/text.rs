//! Text that came from outside, made safe to print.

use std::fmt;

/// Displays `text` with every control character escaped (`\u{1b}`, `\r`, `\n`, `\t`), so that
/// a value a stranger chose cannot move a terminal's cursor, recolour it, or start what looks
/// like a new log line. Everything else, non-ASCII letters included, is printed as it is.
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_debug())?;
            } else {
                f.write_fmt(format_args!("{c}"))?;
            }
        }
        Ok(())
    }
}

/// Like [`Escaped`], but keeps line breaks and tabs: for a block of text printed on lines of its
/// own (a stored payload). A carriage return, which could overwrite a line already printed, is
/// still escaped.
pub fn escaped_block(text: &str) -> String {
    text.split('\n')
        .map(|line| {
            line.split('\t')
                .map(|part| Escaped(part).to_string())
                .collect::<Vec<_>>()
                .join("\t")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first `max` characters of `text`, escaped, with `…` when it was longer.
pub fn escaped_prefix(text: &str, max: usize) -> String {
    let mut out = Escaped(&text.chars().take(max).collect::<String>()).to_string();
    if text.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

/// Third-party text (an email API's error body, an SMTP server's reply) made fit for a log
/// line: anything that looks like an email address is replaced by `<address>` (such text often
/// names the recipient, and customer addresses stay out of the log), control characters are
/// escaped, and it is cut to 200 characters.
pub fn third_party_for_log(text: &str) -> String {
    let redacted: Vec<String> = text
        .split(' ')
        .map(|word| {
            if word.contains('@') {
                "<address>".to_owned()
            } else {
                word.to_owned()
            }
        })
        .collect();
    escaped_prefix(&redacted.join(" "), 200)
}

/// `url` with its userinfo (`user:password@`) replaced by `***@`, for a message that names a
/// configured URL: `smtp://sekali:s3cret@mail.example:587` is printed
/// `smtp://***@mail.example:587`. Text that is not a URL is redacted the same way where it
/// looks like one (`scheme://…@host`), so a malformed setting that carries a password is not
/// echoed either.
pub fn without_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let authority_start = scheme_end + 3;
    let authority_end = url[authority_start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |end| authority_start + end);
    match url[authority_start..authority_end].rfind('@') {
        Some(at) => format!(
            "{}***{}",
            &url[..authority_start],
            &url[authority_start + at..]
        ),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(
            Escaped("ord\u{1b}[31m\r\nFAKE\u{7}").to_string(),
            "ord\\u{1b}[31m\\r\\nFAKE\\u{7}"
        );
        assert_eq!(Escaped("pesanan-é-1").to_string(), "pesanan-é-1");
        assert_eq!(escaped_prefix("abcdef", 3), "abc…");
        assert_eq!(escaped_prefix("ab\n", 3), "ab\\n");
        assert_eq!(escaped_block("a\n\tb\rc\u{1b}"), "a\n\tb\\rc\\u{1b}");
    }

    #[test]
    fn a_urls_userinfo_is_never_printed() {
        for (url, printed) in [
            ("ftp://user:PASSW0RD@host/x", "ftp://***@host/x"),
            (
                "smtps://a%40b:p@ss@mail.example:465",
                "smtps://***@mail.example:465",
            ),
            (
                "https://api.example/v1?to=a@b.example",
                "https://api.example/v1?to=a@b.example",
            ),
            ("https://key@api.example", "https://***@api.example"),
            ("not a url", "not a url"),
            ("http://host", "http://host"),
        ] {
            assert_eq!(without_userinfo(url), printed, "{url}");
        }
    }

    #[test]
    fn third_party_text_loses_addresses_and_line_breaks() {
        assert_eq!(
            third_party_for_log("422: recipient sari@toko.example rejected\nINFO forged"),
            "422: recipient <address> rejected\\nINFO forged"
        );
        assert_eq!(third_party_for_log(&"x".repeat(300)).chars().count(), 201);
    }
}
