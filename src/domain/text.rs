//! Text that came from outside, made safe to print.

use std::fmt;

/// `text` as one path segment of a URL: everything but RFC 3986's unreserved characters
/// percent-encoded, so an id is one segment whatever it holds (`/`, `?`, `#`, `:`), and a plain
/// id reads as it is.
pub fn path_segment(text: &str) -> String {
    const UNRESERVED_KEPT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(text, UNRESERVED_KEPT).to_string()
}

/// True for `.` and `..`: as a path segment (percent-encoded too), a step of the path that every
/// client resolves before it asks, so no link or `Location` can name it.
pub fn is_path_step(text: &str) -> bool {
    text == "." || text == ".."
}

/// Displays `text` with every character a terminal would act on or not show escaped, so that a
/// value a stranger chose cannot move a terminal's cursor, recolour it, start what looks like a
/// new log line, reorder what is printed after it, or hide inside an id that looks like another:
///
/// - control characters (C0, DEL and C1), as Rust writes them (`\u{1b}`, `\r`, `\n`, `\t`);
/// - the characters of [`is_invisible`] (bidi overrides and isolates, zero-width characters,
///   U+2028 and U+2029, …), as `\u{202e}`.
///
/// Everything else, non-ASCII letters included, is printed as it is.
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_debug())?;
            } else if is_invisible(c) {
                write!(f, "{}", c.escape_unicode())?;
            } else {
                f.write_fmt(format_args!("{c}"))?;
            }
        }
        Ok(())
    }
}

/// True for a character that is not a control character but that a terminal shows as nothing,
/// or that changes how the text around it is shown:
///
/// - every `Default_Ignorable_Code_Point` of Unicode (DerivedCoreProperties.txt), the characters
///   a renderer draws as nothing: the bidi embeddings, overrides and isolates (U+202A–U+202E,
///   U+2066–U+2069) and marks (U+200E, U+200F, U+061C), the zero-width space, joiners and word
///   joiner (U+200B–U+200D, U+2060), the invisible operators (U+2061–U+2064), the BOM / zero-width
///   no-break space (U+FEFF), the soft hyphen (U+00AD), the Hangul fillers (U+115F, U+1160,
///   U+3164, U+FFA0), the variation selectors (U+FE00–U+FE0F, U+E0100–U+E01EF) and the tags
///   (U+E0000–U+E007F), with the code points Unicode keeps unassigned among them so that what it
///   assigns there later stays invisible too;
/// - the line and paragraph separators (U+2028, U+2029), which some terminals and most text
///   tools take for a line break;
/// - the interlinear annotation characters (U+FFF9–U+FFFB), format characters that most
///   renderers show as nothing.
///
/// An emoji sequence with a zero-width joiner or a variation selector is shown with them
/// escaped: ids are the text this protects, and an id with an emoji is rare and better seen.
pub fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFFB}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

/// JSON text as serde_json writes it, with every character that [`Escaped`] escapes, but for
/// the line breaks and tabs of its layout, written as a JSON `\uXXXX` escape: the same value
/// for a JSON reader (`jq -r` prints the id as it was stored), and nothing a terminal acts on
/// or hides. serde_json escapes only U+0000–U+001F, `"` and `\` in a string; DEL, the C1
/// controls (U+009B is CSI to a terminal in 8-bit mode), the bidi overrides and the rest of
/// [`is_invisible`] it writes as they are. Outside its strings, JSON text holds only ASCII
/// punctuation, digits, letters and layout whitespace, and serde_json writes no raw line break
/// or tab inside one, so every character replaced here is inside a string.
pub fn escaped_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if (c.is_control() && !matches!(c, '\n' | '\r' | '\t')) || is_invisible(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
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
    fn bidi_invisible_and_separator_characters_are_escaped_and_the_rest_kept() {
        // An id that a right-to-left override shows as `ord_exe.pdf`.
        assert_eq!(
            Escaped("ord_\u{202e}fdp.exe").to_string(),
            "ord_\\u{202e}fdp.exe"
        );
        for (c, escaped) in [
            ('\u{202a}', "\\u{202a}"),
            ('\u{202d}', "\\u{202d}"),
            ('\u{2066}', "\\u{2066}"),
            ('\u{2069}', "\\u{2069}"),
            ('\u{061c}', "\\u{61c}"),
            ('\u{200b}', "\\u{200b}"),
            ('\u{200d}', "\\u{200d}"),
            ('\u{200f}', "\\u{200f}"),
            ('\u{2060}', "\\u{2060}"),
            ('\u{2064}', "\\u{2064}"),
            ('\u{feff}', "\\u{feff}"),
            ('\u{00ad}', "\\u{ad}"),
            ('\u{3164}', "\\u{3164}"),
            ('\u{fe0f}', "\\u{fe0f}"),
            ('\u{e0041}', "\\u{e0041}"),
            ('\u{2028}', "\\u{2028}"),
            ('\u{2029}', "\\u{2029}"),
            ('\u{fff9}', "\\u{fff9}"),
            // C1 controls are control characters: U+009B is CSI on a terminal in 8-bit mode.
            ('\u{009b}', "\\u{9b}"),
            ('\u{007f}', "\\u{7f}"),
        ] {
            assert_eq!(
                Escaped(&format!("a{c}b")).to_string(),
                format!("a{escaped}b")
            );
        }
        // Visible text around them is kept: letters of any script, spaces, the no-break space of
        // a formatted amount, an emoji without a joiner or selector.
        for kept in [
            "Rp\u{a0}150.000",
            "ترتيب",
            "注文",
            "pesanan é",
            "🙂",
            "a\u{2009}b",
        ] {
            assert_eq!(Escaped(kept).to_string(), kept);
        }
        assert_eq!(escaped_block("a\u{202e}\n\tb"), "a\\u{202e}\n\tb");
        assert_eq!(
            third_party_for_log("bad\u{2028}INFO forged"),
            "bad\\u{2028}INFO forged"
        );
    }

    #[test]
    fn json_keeps_its_value_and_layout_with_nothing_raw_that_a_terminal_acts_on() {
        let id = "evt_\u{202e}gnp.exe\u{7f}\u{9b}\u{1b}\n\u{200b}\u{2028}\u{e0041}é🙂";
        let value = serde_json::json!({ "event_id": id, "n": 1 });
        let compact = serde_json::to_string(&value).unwrap();
        // What serde_json leaves raw, and why this function exists.
        assert!(
            compact.contains(['\u{202e}', '\u{7f}', '\u{9b}', '\u{2028}']),
            "{compact}"
        );
        let escaped = escaped_json(&compact);
        assert_eq!(
            escaped,
            r#"{"event_id":"evt_\u202egnp.exe\u007f\u009b\u001b\n\u200b\u2028\udb40\udc41é🙂","n":1}"#
        );
        let read: serde_json::Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(read, value, "the same value for a JSON reader");
        let pretty = escaped_json(&serde_json::to_string_pretty(&value).unwrap());
        assert!(
            pretty.contains("\n  \"event_id\": \"evt_\\u202e"),
            "{pretty}"
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&pretty).unwrap(),
            value
        );
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
