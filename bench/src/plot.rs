//! The soak's samples drawn as one PNG: four panels over time (relay RSS
//! and open file descriptors; enqueue → delivered p50 and p99; backlog;
//! table sizes with their indexes). Text is set in DejaVu Sans (Debian's
//! fonts-dejavu-core), read at run time; without it the panels are drawn
//! without captions.

use std::path::Path;

use plotters::prelude::*;

use crate::soak::Sample;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Register the font once; false when it is missing.
fn font() -> bool {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REGISTERED.get_or_init(|| match std::fs::read(FONT) {
        Ok(bytes) => {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
        }
        Err(_) => false,
    })
}

type Series<'a> = (&'a str, RGBColor, Box<dyn Fn(&Sample) -> f64 + 'a>);

fn panel(
    area: &DrawingArea<BitMapBackend, plotters::coord::Shift>,
    title: &str,
    unit: &str,
    samples: &[Sample],
    series: Vec<Series>,
    text: bool,
) -> anyhow::Result<()> {
    let x_max = samples.last().map_or(1.0, |s| s.t_s / 60.0).max(1.0 / 60.0);
    let y_max = samples
        .iter()
        .flat_map(|s| series.iter().map(move |(_, _, f)| f(s)))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.1;
    let mut builder = ChartBuilder::on(area);
    builder
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60);
    if text {
        builder.caption(format!("{title} ({unit})"), ("sans-serif", 18));
    }
    let mut chart = builder.build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("minutes").label_style(("sans-serif", 12));
    } else {
        mesh.disable_x_mesh()
            .disable_y_mesh()
            .x_labels(0)
            .y_labels(0);
    }
    mesh.draw()?;
    for (name, color, f) in &series {
        let line = chart.draw_series(LineSeries::new(
            samples.iter().map(|s| (s.t_s / 60.0, f(s))),
            color.stroke_width(2),
        ))?;
        if text {
            let c = *color;
            line.label(*name).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))
            });
        }
    }
    if text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            .draw()?;
    }
    Ok(())
}

pub(crate) fn draw(samples: &[Sample], png: &Path) -> anyhow::Result<()> {
    let text = font();
    let root = BitMapBackend::new(png, (1400, 1000)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((2, 2));
    panel(
        &panels[0],
        "Relay memory and descriptors",
        "MB, count",
        samples,
        vec![
            ("RSS, MB", BLUE, Box::new(|s: &Sample| s.relay_rss_mb)),
            ("open fds", RED, Box::new(|s: &Sample| s.relay_fds as f64)),
            (
                "Postgres connections",
                GREEN,
                Box::new(|s: &Sample| s.pg_connections as f64),
            ),
        ],
        text,
    )?;
    panel(
        &panels[1],
        "Enqueue to delivered",
        "ms",
        samples,
        vec![
            ("p50", BLUE, Box::new(|s: &Sample| s.p50_ms)),
            ("p99", RED, Box::new(|s: &Sample| s.p99_ms)),
        ],
        text,
    )?;
    panel(
        &panels[2],
        "Backlog and throughput",
        "intents, per s",
        samples,
        vec![
            (
                "backlog (pending + claimed)",
                RED,
                Box::new(|s: &Sample| s.backlog as f64),
            ),
            (
                "delivered per s",
                BLUE,
                Box::new(|s: &Sample| s.delivered_per_s),
            ),
        ],
        text,
    )?;
    panel(
        &panels[3],
        "Table sizes with indexes",
        "MB",
        samples,
        vec![
            ("intents", BLUE, Box::new(|s: &Sample| s.intents_mb)),
            ("attempts", RED, Box::new(|s: &Sample| s.attempts_mb)),
            ("ledger", GREEN, Box::new(|s: &Sample| s.ledger_mb)),
        ],
        text,
    )?;
    root.present()?;
    Ok(())
}
