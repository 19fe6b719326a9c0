//! `ACKGATE_<SECTION>__<KEY>=value` overrides, applied to the parsed file before it is checked.
//!
//! Every `ACKGATE_` variable is config, except `ACKGATE_DEV_*` (the repository's scripts and tests
//! use those): a name that is not a key stops the start, as an unknown key in the file does.

use super::{Config, ENV_PREFIX};

/// Variables with this prefix belong to the scripts and tests, never to the gateway's config.
const DEV_PREFIX: &str = "ACKGATE_DEV_";

/// `ACKGATE_KAFKA__PROPERTIES__<NAME>` sets one librdkafka property, dots written as `_`
/// (`ACKGATE_KAFKA__PROPERTIES__SASL_PASSWORD` is `sasl.password`): secrets come from the
/// environment one by one, without a TOML table in one variable.
const KAFKA_PROPERTY_PREFIX: &str = "properties__";

/// Applies the overrides in `env` to `table`. A text key takes the value as written
/// (`ACKGATE_AUTH__ADMIN_TOKEN=12345` is the token "12345"); other values are read as TOML (`500`,
/// `true`, `["a"]`).
pub fn apply(table: &mut toml::Table, env: impl IntoIterator<Item = (String, String)>) -> anyhow::Result<()> {
    // The defaults say which keys exist and which of them hold text.
    let defaults = toml::Table::try_from(Config::default())?;
    for (name, raw) in env {
        if name.starts_with(DEV_PREFIX) {
            continue;
        }
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else { continue };
        let Some((section, key)) = rest.split_once("__") else {
            anyhow::bail!("{name}: {}", not_a_key_hint(&defaults, rest));
        };
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        if let ("kafka", Some(property)) = (section.as_str(), key.strip_prefix(KAFKA_PROPERTY_PREFIX)) {
            if property.is_empty() || property.contains("__") {
                anyhow::bail!("{name}: a librdkafka property is ACKGATE_KAFKA__PROPERTIES__<NAME>, its dots written as _");
            }
            insert(table, &name, &["kafka", "properties"], property.replace('_', "."), toml::Value::String(raw))?;
            continue;
        }
        let Some(default) = defaults.get(&section).and_then(|s| s.as_table()).and_then(|s| s.get(&key)) else {
            anyhow::bail!("{name}: there is no config key {section}.{key} (config.toml lists every key; variables of the scripts use {DEV_PREFIX})");
        };
        let value = if default.is_str() {
            toml::Value::String(raw)
        } else {
            format!("v = {raw}").parse::<toml::Table>().ok().and_then(|mut t| t.remove("v")).unwrap_or(toml::Value::String(raw))
        };
        insert(table, &name, &[&section], key, value)?;
    }
    Ok(())
}

/// Why `ACKGATE_<rest>` (no `__`) is not a key: a section and a key joined by a single underscore
/// get the right spelling.
fn not_a_key_hint(defaults: &toml::Table, rest: &str) -> String {
    let lower = rest.to_ascii_lowercase();
    let mistyped = defaults.iter().find_map(|(section, keys)| {
        let key = lower.strip_prefix(section.as_str())?.strip_prefix('_')?;
        keys.get(key).map(|_| (section, key))
    });
    match mistyped {
        Some((section, key)) => format!(
            "a config key is ACKGATE_<SECTION>__<KEY>, with two underscores: did you mean {ENV_PREFIX}{}__{}?",
            section.to_ascii_uppercase(),
            key.to_ascii_uppercase()
        ),
        None => format!("not a config key (ACKGATE_<SECTION>__<KEY>); variables of the scripts use {DEV_PREFIX}"),
    }
}

/// Sets `path.key = value` in `table`, creating the tables on the way.
fn insert(table: &mut toml::Table, name: &str, path: &[&str], key: String, value: toml::Value) -> anyhow::Result<()> {
    let mut at = table;
    for part in path {
        let entry = at.entry(part.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        at = entry.as_table_mut().ok_or_else(|| anyhow::anyhow!("{name}: config key {part} is not a table in the file"))?;
    }
    at.insert(key, value);
    Ok(())
}
