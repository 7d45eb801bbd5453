//! The HTML page: the vendored chart library (uPlot, MIT, `crates/cli/assets/`), the page's
//! own script and style, and the run's aggregates as one JSON island, all inline so the file
//! opens offline anywhere.

use serde_json::Value;

const UPLOT_JS: &str = include_str!("../../assets/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../assets/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("../../assets/uPlot.LICENSE");
const PAGE_JS: &str = include_str!("page.js");
const PAGE_CSS: &str = include_str!("page.css");

/// JSON that can sit inside `<script type="application/json">`: `</` would end the element
/// early, so it is written `<\/` (the same string to a JSON parser).
fn script_safe_json(data: &Value) -> String {
    data.to_string().replace("</", "<\\/")
}

pub fn render(data: &Value) -> String {
    let title = data
        .get("run")
        .and_then(Value::as_str)
        .unwrap_or("msmemscope run");
    let title = title
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    let license = UPLOT_LICENSE.replace("*/", "* /");
    let mut html = String::with_capacity(UPLOT_JS.len() + 64 * 1024);
    html.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    html.push_str(&format!("<title>msmemscope report: {title}</title>\n"));
    html.push_str("<style>\n");
    html.push_str(UPLOT_CSS);
    html.push('\n');
    html.push_str(PAGE_CSS);
    html.push_str("</style>\n</head>\n<body>\n");
    html.push_str("<script id=\"report-data\" type=\"application/json\">");
    html.push_str(&script_safe_json(data));
    html.push_str("</script>\n<script>\n/* uPlot 1.6.32 (https://github.com/leeoniya/uPlot)\n");
    html.push_str(&license);
    html.push_str("*/\n");
    html.push_str(UPLOT_JS);
    html.push_str("\n</script>\n<script>\n");
    html.push_str(PAGE_JS);
    html.push_str("\n</script>\n</body>\n</html>\n");
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_cannot_close_its_script_element() {
        let data = serde_json::json!({"run": "a</script><b>", "x": "</SCRIPT>"});
        let html = render(&data);
        let island = html
            .split("<script id=\"report-data\" type=\"application/json\">")
            .nth(1)
            .unwrap();
        let json = island.split("</script>").next().unwrap();
        let back: Value = serde_json::from_str(json).unwrap();
        assert_eq!(back, data);
        assert!(html.contains("<title>msmemscope report: a&lt;/script&gt;&lt;b&gt;</title>"));
    }
}
