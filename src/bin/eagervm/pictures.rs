//! `eagervm analyze` and `eagervm plot`: what they print, on top of `eagervm::trace`'s
//! analysis, `eagervm::cli::graph` (DOT files, rendering) and `eagervm::cli::plot` (pictures).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use eagervm::cli::graph::{render_svg, write_file, DEFAULT_TIMEOUT};
use eagervm::cli::plot::{self, Format, Timeline};
use eagervm::cli::CliError;
use eagervm::trace::{self, DotLimits};

/// How `analyze` draws the graph.
#[derive(clap::Args, Clone)]
pub struct AnalyzeArgs {
    /// Write the graph in Graphviz DOT to this file.
    #[arg(long, value_name = "OUT.dot")]
    pub(crate) dot: Option<PathBuf>,
    /// Render the graph to SVG with graphviz `dot` (which must be installed).
    #[arg(long, value_name = "OUT.svg")]
    pub(crate) svg: Option<PathBuf>,
    /// Draw one node per instruction (releases included) instead of the condensed graph.
    #[arg(long)]
    full: bool,
    /// Draw at most this many nodes (the first ones in program order); the rest is cut, and
    /// the output says so.
    #[arg(long, value_name = "N", default_value_t = DotLimits::default().max_nodes)]
    max_nodes: usize,
    /// Draw at most this many edges.
    #[arg(long, value_name = "N", default_value_t = DotLimits::default().max_edges)]
    max_edges: usize,
    /// Stop graphviz if it has not rendered the SVG after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_TIMEOUT.as_secs_f64())]
    render_timeout: f64,
}

/// The pictures `eagervm plot` draws.
#[derive(clap::Subcommand)]
pub enum PlotCommand {
    /// The loss curve of the MLP: trains it as `eagervm run mlp` does, or reads the losses
    /// from a file.
    Loss {
        /// Read the losses from this file (a JSON report with `losses`, a JSON list, or
        /// numbers separated by spaces, commas or lines) instead of training.
        #[arg(long, value_name = "FILE")]
        from: Option<PathBuf>,
        /// Training steps (default 60).
        #[arg(long, value_name = "N", conflicts_with = "from")]
        steps: Option<usize>,
        #[command(flatten)]
        out: OutArgs,
    },
    /// Busy time per stream over a run, from a timeline (`--profile OUT.json` of `run` or
    /// `replay`).
    Timeline {
        /// The Chrome trace-event JSON file.
        profile: PathBuf,
        #[command(flatten)]
        out: OutArgs,
    },
    /// Benchmark results across workloads, from `eagervm bench --json` output.
    Bench {
        /// The file of JSON results (one object per line, or a JSON list).
        results: PathBuf,
        /// The numeric fields to draw, e.g. `ratio,floor_ratio` (default: e2e, baseline and
        /// floor throughput, those present).
        #[arg(long, value_name = "FIELD", value_delimiter = ',')]
        metric: Vec<String>,
        #[command(flatten)]
        out: OutArgs,
    },
}

/// Where a picture goes.
#[derive(clap::Args, Clone)]
pub struct OutArgs {
    /// The picture to write: `.svg` or `.png`.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// The format, when the file name does not tell it: `svg` or `png`.
    #[arg(long, value_parser = parse_format)]
    format: Option<Format>,
}

fn parse_format(s: &str) -> Result<Format, String> {
    Format::parse(s).ok_or_else(|| format!("`{s}` is not a picture format (use svg or png)"))
}

pub fn analyze(file: &Path, args: &AnalyzeArgs) -> Result<(), CliError> {
    let t = crate::load_trace(file)?;
    let a = trace::analyze(&t)?;
    // The analysis keeps what it needs; the trace's statements can go before the graph is built.
    drop(t);
    say!("{}: {} instructions, {} dependency edges", file.display(), a.instructions, a.edges);
    say!("  instructions per stream:");
    for (id, desc, n) in &a.per_stream {
        say!("    s{id:<3} {desc:<16} {n}");
    }
    if let Some(d) = eagervm::cli::summary::dtypes(&a.dtypes) {
        say!("{d}");
    }
    say!("  critical path: {} instructions", a.critical_path);
    say!("  available parallelism: {:.2} (instructions / critical path)", a.parallelism);
    let graph = if args.full { a.full() } else { a.condensed() };
    let limits = DotLimits { max_nodes: args.max_nodes, max_edges: args.max_edges };
    let dot = graph.dot(&limits);
    let releases: u64 = graph.nodes.iter().map(|n| n.releases).sum();
    let how = match graph.condensed {
        true => format!("same-stream chains collapsed, {releases} releases folded"),
        false => "one node per instruction".to_string(),
    };
    say!("  graph: {} nodes ({how}) and {} edges; the critical path drawn in red", dot.nodes, dot.edges);
    if dot.is_cut() && (args.dot.is_some() || args.svg.is_some()) {
        say!(
            "  the graph is larger than the cap (--max-nodes {}, --max-edges {}): drawing the first {} nodes \
             (up to trace line {}) and {} edges, and cutting {} nodes and {} edges; pass larger --max-nodes / \
             --max-edges to draw more (graphviz's layout time grows much faster than the graph)",
            limits.max_nodes,
            limits.max_edges,
            dot.drawn_nodes,
            dot.cut_after_line.unwrap_or(0),
            dot.drawn_edges,
            dot.nodes - dot.drawn_nodes,
            dot.edges - dot.drawn_edges
        );
    }
    if args.dot.is_none() && args.svg.is_none() {
        say!("  (--dot FILE writes it as Graphviz DOT, --svg FILE renders it)");
    }
    if let Some(path) = &args.dot {
        write_file(path, dot.text.as_bytes())?;
        say!("  DOT graph written to {} ({} bytes)", path.display(), dot.text.len());
    }
    if let Some(svg) = &args.svg {
        let timeout = Duration::try_from_secs_f64(args.render_timeout).map_err(|_| {
            CliError::Usage(format!("--render-timeout {}: not a number of seconds", args.render_timeout))
        })?;
        let t0 = Instant::now();
        render_svg("dot".as_ref(), &dot.text, svg, timeout)?;
        say!("  SVG written to {} (graphviz took {:.1?})", svg.display(), t0.elapsed());
    }
    Ok(())
}

pub fn plot(what: PlotCommand) -> Result<(), CliError> {
    match what {
        PlotCommand::Loss { from, steps, out } => {
            let (losses, title) = match &from {
                Some(path) => (plot::read_losses(path)?, format!("loss ({})", path.display())),
                None => {
                    let config = eagervm::Config::from_env();
                    let losses = plot::mlp_losses(config, steps)
                        .map_err(|error| CliError::Program { program: "mlp".into(), error })?;
                    (losses, "mlp: training loss".to_string())
                }
            };
            plot::plot_loss(&losses, &title, &out.output, out.format)?;
            let (first, last) =
                (losses.first().copied().unwrap_or(f32::NAN), losses.last().copied().unwrap_or(f32::NAN));
            say!(
                "loss curve of {} steps ({first:.6} -> {last:.6}) written to {}",
                losses.len(),
                out.output.display()
            );
        }
        PlotCommand::Timeline { profile, out } => {
            let t = Timeline::read(&profile)?;
            plot::plot_timeline(&t, &out.output, out.format)?;
            say!("busy time of {} streams written to {}", t.tracks.len(), out.output.display());
        }
        PlotCommand::Bench { results, metric, out } => {
            let rows = plot::read_bench(&results)?;
            plot::plot_bench(&rows, &metric, &out.output, out.format)?;
            say!("{} workloads written to {}", rows.len(), out.output.display());
        }
    }
    Ok(())
}
