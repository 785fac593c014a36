"""`spectrace report TRACE -o run.html`: one self-contained HTML page of a run, opened from disk.

    data.py      the trace as the page reads it: each step once, compact (its tree as the viewers'
                 node model, viz/steptree.py), the token texts once, the summary
    page.py      the page: the data as inert JSON, the vendored-free CSS and JavaScript inline,
                 a Content-Security-Policy that lets only the page's own script run
    assets/      report.js (vanilla JavaScript: summary charts, coloured text, the step viewer)
                 and report.css

Every string of a trace is untrusted: the JSON is escaped so that no `</script>` ends its element,
and the script builds the page with textContent and setAttribute only, never HTML from data.
"""
