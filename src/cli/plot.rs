//! `cudapool plot TRACE -o memory.svg`: allocated, reserved and limit per device over time,
//! with OOM markers, from a `CUDAPOOL_TRACE` file.
//!
//! The input is bounded before it is believed: a regular file of at most [`MAX_BYTES`] (never
//! a FIFO or device), at most [`MAX_EVENTS`] events and [`MAX_DEVICES`] devices (what a trace
//! of cudapool's can hold); more is refused with one line. The picture is written as every
//! output file is (`outfile`).

use plotters::prelude::*;
use std::collections::BTreeMap;

/// (seconds, allocated, reserved, limit), sizes in bytes (in the axis's unit once drawn).
type Sample = (f64, f64, f64, f64);
/// A line of the chart: its name, colour, which value of a sample it draws, and its width.
type Line = (&'static str, RGBColor, fn(&Sample) -> f64, u32);

#[derive(Default)]
struct Series {
    samples: Vec<Sample>,
    ooms: Vec<f64>,
}

const GIB: f64 = (1u64 << 30) as f64;
/// The largest trace read (a trace of cudapool's keeps 200,000 events: about 30 MB).
pub const MAX_BYTES: u64 = 64 << 20;
/// The most events drawn.
pub const MAX_EVENTS: usize = 1_000_000;
/// The most devices drawn (a page holds 64).
pub const MAX_DEVICES: usize = 64;

/// The unit an axis reaching `top` bytes is drawn in, and its size in bytes.
fn unit_for(top: f64) -> (&'static str, f64) {
    if top >= GIB {
        ("GiB", GIB)
    } else if top >= (1u64 << 20) as f64 {
        ("MiB", (1u64 << 20) as f64)
    } else {
        ("KiB", 1024.0)
    }
}

/// Where the picture goes: `-o -` is the standard output; otherwise a file named `.svg`.
fn check_output(output: &str) -> Result<(), String> {
    let out_path = std::path::Path::new(output);
    if output == "-" {
        return Ok(());
    }
    if out_path.is_dir() {
        return Err(format!(
            "{output} is a folder: name the picture's file, such as {}",
            out_path.join("memory.svg").display()
        ));
    }
    if !output.ends_with(".svg") {
        return Err(format!(
            "{output}: cudapool draws SVG only (name the file .svg, or -o - for the standard output); for a PNG to paste, convert it: `rsvg-convert memory.svg -o memory.png` (librsvg2-bin) or `convert memory.svg memory.png` (ImageMagick)"
        ));
    }
    cudapool::base::outfile::check(out_path)
}

/// A chart's title: the program and its pid, the device and its GPU, as far as the trace says.
fn title(json: &serde_json::Value, dev: i64) -> String {
    let about = &json["otherData"];
    let pid = json["traceEvents"][0]["pid"].as_u64();
    let who = match (about["program"].as_str().filter(|p| !p.is_empty()), pid) {
        (Some(p), Some(pid)) => format!("{p} (pid {pid}), "),
        (Some(p), None) => format!("{p}, "),
        (None, Some(pid)) => format!("pid {pid}, "),
        (None, None) => String::new(),
    };
    let gpu = about["gpus"][dev.to_string()]
        .as_str()
        .map_or(String::new(), |u| format!(" ({u})"));
    format!("{who}device {dev}{gpu}")
}

pub fn plot(input: &str, output: &str) -> Result<(), String> {
    check_output(output)?;
    let out_path = std::path::Path::new(output);
    let bytes = cudapool::base::outfile::read_bounded(std::path::Path::new(input), MAX_BYTES)?;
    let json: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("{input}: not a trace: {e}"))?;
    let events = json["traceEvents"]
        .as_array()
        .ok_or(format!("{input}: no traceEvents"))?;
    if events.len() > MAX_EVENTS {
        return Err(format!(
            "{input}: {} events, more than the {MAX_EVENTS} drawn at most",
            events.len()
        ));
    }
    let mut devices: BTreeMap<i64, Series> = BTreeMap::new();
    for e in events {
        let ts = e["ts"].as_f64().unwrap_or(0.0) / 1e6;
        match e["ph"].as_str() {
            Some("C") => {
                let Some(dev) = e["name"]
                    .as_str()
                    .and_then(|n| n.strip_prefix("device "))
                    .and_then(|n| n.strip_suffix(" memory"))
                    .and_then(|n| n.parse::<i64>().ok())
                else {
                    continue;
                };
                let a = &e["args"];
                let g = |k: &str| a[k].as_f64().unwrap_or(0.0);
                devices.entry(dev).or_default().samples.push((
                    ts,
                    g("allocated"),
                    g("reserved"),
                    g("limit"),
                ));
            }
            Some("i") if e["name"] == "oom" => {
                let dev = e["args"]["device"].as_i64().unwrap_or(0);
                devices.entry(dev).or_default().ooms.push(ts);
            }
            _ => {}
        }
        if devices.len() > MAX_DEVICES {
            return Err(format!(
                "{input}: names more than {MAX_DEVICES} devices (a trace of cudapool's has at most {MAX_DEVICES})"
            ));
        }
    }
    if devices.values().all(|s| s.samples.is_empty()) {
        return Err(format!("{input}: the trace holds no memory samples"));
    }
    // The axis in the unit that suits the run: a 100 MiB run in MiB, not in hundredths of GiB.
    let top = devices
        .values()
        .flat_map(|s| s.samples.iter().map(|x| x.1.max(x.2).max(x.3)))
        .fold(0.0, f64::max);
    let (unit, per) = unit_for(top);
    for s in devices.values_mut() {
        for x in &mut s.samples {
            x.1 /= per;
            x.2 /= per;
            x.3 /= per;
        }
    }
    let n = devices.len() as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 360 * n)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        for ((dev, s), area) in devices.iter().zip(root.split_evenly((n as usize, 1))) {
            let t_end = s.samples.iter().map(|x| x.0).fold(0.0, f64::max).max(1e-3);
            let data_max = s
                .samples
                .iter()
                .map(|x| x.1.max(x.2).max(x.3))
                .fold(0.0, f64::max)
                .max(1e-6);
            // The top third is left empty for the legend: it never covers a line.
            let y_max = data_max * 1.5;
            let mut chart = ChartBuilder::on(&area)
                .caption(title(&json, *dev), ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(60)
                .build_cartesian_2d(0.0..t_end, 0.0..y_max)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc("seconds")
                .y_desc(unit)
                .draw()
                .map_err(|e| e.to_string())?;
            let step = |pick: fn(&Sample) -> f64| -> Vec<(f64, f64)> {
                // Step lines: a value holds until the next sample.
                let mut v = Vec::new();
                for w in s.samples.windows(2) {
                    v.push((w[0].0, pick(&w[0])));
                    v.push((w[1].0, pick(&w[0])));
                }
                if let Some(last) = s.samples.last() {
                    v.push((last.0, pick(last)));
                }
                v
            };
            // Reserved wide and under, allocated narrow and over it: where they are equal,
            // both still show.
            let series: [Line; 3] = [
                ("reserved", GREEN, |x| x.2, 5),
                ("allocated", BLUE, |x| x.1, 2),
                ("limit", BLACK, |x| x.3, 2),
            ];
            for (name, color, pick, width) in series {
                if name == "limit" && s.samples.iter().all(|x| x.3 == 0.0) {
                    continue;
                }
                chart
                    .draw_series(LineSeries::new(step(pick), color.stroke_width(width)))
                    .map_err(|e| e.to_string())?
                    .label(name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            }
            if !s.ooms.is_empty() {
                // Just above the lines, below the legend's band.
                let y = data_max * 1.04;
                chart
                    .draw_series(
                        s.ooms
                            .iter()
                            .map(|&t| Cross::new((t, y), 6, RED.stroke_width(2))),
                    )
                    .map_err(|e| e.to_string())?
                    .label("OOM")
                    .legend(|(x, y)| Cross::new((x + 10, y), 5, RED));
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    if output == "-" {
        super::out::out(&svg);
        return Ok(());
    }
    cudapool::base::outfile::write(out_path, svg.as_bytes())?;
    super::out::outln(&format!("wrote {output}"));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_axis_unit_suits_the_run() {
        assert_eq!(super::unit_for(100.0 * 1048576.0).0, "MiB");
        assert_eq!(super::unit_for(3.0 * super::GIB).0, "GiB");
        assert_eq!(super::unit_for(4096.0).0, "KiB");
    }
}
