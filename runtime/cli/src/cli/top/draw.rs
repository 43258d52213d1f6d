//! Drawing `vigil top`: a pure function of the [`Model`] and the [`Ui`] state onto a ratatui frame. Ratatui keeps
//! the previous frame and sends only the cells that changed, so a refresh does not flicker.

use super::model::{JobRow, Model};
use crate::cli::fmt_secs;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Tabs};
use ratatui::Frame;

/// The smallest terminal `vigil top` draws on (columns, rows); below it, it says so.
pub(crate) const MIN_SIZE: (u16, u16) = (60, 12);

/// The views, in the order of their number keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum View {
    /// The four panels at once.
    Overview,
    /// The TBON.
    Tree,
    /// Nodes by state.
    Nodes,
    /// Running and pending jobs.
    Queue,
    /// Recent verdicts.
    Verdicts,
}

impl View {
    /// Every view, in key order (`1` is the first).
    pub(crate) const ALL: [View; 5] = [View::Overview, View::Tree, View::Nodes, View::Queue, View::Verdicts];

    fn title(self) -> &'static str {
        match self {
            View::Overview => "overview",
            View::Tree => "tree",
            View::Nodes => "nodes",
            View::Queue => "queue",
            View::Verdicts => "verdicts",
        }
    }

    /// The next view (Tab), wrapping round.
    pub(crate) fn next(self) -> View {
        let i = View::ALL.iter().position(|v| *v == self).unwrap_or(0);
        View::ALL[(i + 1) % View::ALL.len()]
    }
}

/// What the user chose and what the screen says besides the model.
#[derive(Debug, Clone)]
pub(crate) struct Ui {
    /// The view shown.
    pub(crate) view: View,
    /// The selected row of the queue (Enter descends into it).
    pub(crate) selected: usize,
    /// The instances descended through, outermost first (`instance`, then each job id).
    pub(crate) path: Vec<String>,
    /// A one-line notice (a late answer, a job with no instance), if any.
    pub(crate) notice: Option<String>,
    /// Wall time of the screen (s since the epoch), for the clock and the verdicts' ages.
    pub(crate) now: f64,
}

impl Default for Ui {
    fn default() -> Self {
        Ui { view: View::Overview, selected: 0, path: vec!["instance".into()], notice: None, now: 0.0 }
    }
}

/// Draw the whole screen.
pub(crate) fn draw(f: &mut Frame<'_>, m: &Model, ui: &Ui) {
    let area = f.area();
    if area.width < MIN_SIZE.0 || area.height < MIN_SIZE.1 {
        let say = format!(
            "terminal too small ({}x{}): vigil top needs at least {}x{}; q quits",
            area.width, area.height, MIN_SIZE.0, MIN_SIZE.1
        );
        f.render_widget(Paragraph::new(say).wrap(ratatui::widgets::Wrap { trim: true }), area);
        return;
    }
    let [head, summary, body, foot] =
        Layout::vertical([Constraint::Length(1), Constraint::Length(1), Constraint::Min(4), Constraint::Length(1)])
            .areas(area);
    let titles: Vec<String> = View::ALL.iter().enumerate().map(|(i, v)| format!("{} {}", i + 1, v.title())).collect();
    let sel = View::ALL.iter().position(|v| *v == ui.view).unwrap_or(0);
    let [tabs, where_] = Layout::horizontal([Constraint::Min(30), Constraint::Length(30)]).areas(head);
    f.render_widget(
        Tabs::new(titles).select(sel).highlight_style(Style::new().add_modifier(Modifier::REVERSED)).padding("", " "),
        tabs,
    );
    f.render_widget(Paragraph::new(ui.path.join(" > ")).right_aligned(), where_);
    f.render_widget(Paragraph::new(summary_line(m)), summary);
    match ui.view {
        View::Overview => {
            // Tree and nodes side by side; the queue and the verdicts, whose lines are long, full width.
            let [top, mid, bottom] =
                Layout::vertical([Constraint::Percentage(40), Constraint::Percentage(35), Constraint::Percentage(25)])
                    .areas(body);
            let [tl, tr] = Layout::horizontal([Constraint::Percentage(40), Constraint::Percentage(60)]).areas(top);
            panel(f, tl, "tree", tree_lines(m), 0);
            panel(f, tr, "nodes", node_lines(m), 0);
            queue_panel(f, mid, m, ui);
            panel(f, bottom, "verdicts", verdict_lines(m, ui.now), 0);
        }
        View::Tree => panel(f, body, "tree", tree_lines(m), 0),
        View::Nodes => panel(f, body, "nodes", node_lines(m), 0),
        View::Queue => queue_panel(f, body, m, ui),
        View::Verdicts => panel(f, body, "verdicts", verdict_lines(m, ui.now), 0),
    }
    let keys = if ui.path.len() > 1 {
        "Tab/1-5 view  ↑↓ job  Enter descend  Esc back  q quit"
    } else {
        "Tab/1-5 view  ↑↓ job  Enter descend  q quit"
    };
    let foot_line = match &ui.notice {
        Some(n) => {
            Line::from(vec![Span::styled(n.clone(), Style::new().fg(Color::Yellow)), Span::raw("  "), keys.into()])
        }
        None => Line::from(keys),
    };
    f.render_widget(Paragraph::new(foot_line), foot);
}

/// A bordered panel of `lines`, scrolled down by `scroll` lines.
fn panel(f: &mut Frame<'_>, area: Rect, title: &str, lines: Vec<Line<'static>>, scroll: u16) {
    let block = Block::new().borders(Borders::ALL).title(format!(" {title} "));
    f.render_widget(Paragraph::new(lines).block(block).scroll((scroll, 0)), area);
}

/// `4 brokers (3 online, 1 lost), topo kary:32 · cores 3/6 · GPUs 0/0 · jobs 1 running, 1 pending`.
fn summary_line(m: &Model) -> Line<'static> {
    let states: Vec<String> = m.rank_states.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let running = m.jobs.iter().filter(|j| j.running()).count();
    let mut s = format!("{} brokers ({}), topo {}", m.size, states.join(", "), m.topo);
    if m.adopted > 0 {
        s.push_str(&format!(", {} adopted", m.adopted));
    }
    s.push_str(&format!(
        " · cores {}/{} · GPUs {}/{} · jobs {running} running, {} pending",
        m.cores.0,
        m.cores.1,
        m.gpus.0,
        m.gpus.1,
        m.jobs.len() - running
    ));
    Line::from(s)
}

fn health_color(h: &str) -> Color {
    match h {
        "full" | "online" | "avail" | "lively" => Color::Green,
        "partial" | "degraded" | "torpid" | "drained" => Color::Yellow,
        "lost" | "drained*" => Color::Red,
        _ => Color::DarkGray,
    }
}

/// One line per broker: `├─ 3 node3: lost (connection closed)`, with `[torpid]`, `[adopted]` marks.
fn tree_lines(m: &Model) -> Vec<Line<'static>> {
    m.tree
        .iter()
        .map(|t| {
            let mut spans = vec![
                Span::raw(format!("{}{} {}: ", t.prefix, t.rank, t.host)),
                Span::styled(t.health, Style::new().fg(health_color(t.health))),
            ];
            if t.state == "torpid" {
                spans.push(Span::styled(" [torpid]", Style::new().fg(Color::Yellow)));
            }
            if t.adopted {
                spans.push(Span::raw(" [adopted]"));
            }
            if !t.reason.is_empty() {
                spans.push(Span::raw(format!(" ({})", t.reason)));
            }
            Line::from(spans)
        })
        .collect()
}

/// One line per node group: `  lost  1 3  node3  connection closed`.
fn node_lines(m: &Model) -> Vec<Line<'static>> {
    let wr = m.nodes.iter().map(|n| n.ranks.len()).max().unwrap_or(0).max(5);
    let wh = m.nodes.iter().map(|n| n.hosts.len()).max().unwrap_or(0).max(8);
    let mut out = vec![Line::styled(
        format!("{:>8} {:>5} {:<wr$} {:<wh$} REASON", "STATE", "N", "RANKS", "NODELIST"),
        Style::new().add_modifier(Modifier::BOLD),
    )];
    for n in &m.nodes {
        out.push(Line::from(vec![
            Span::styled(format!("{:>8}", n.state), Style::new().fg(health_color(&n.state))),
            Span::raw(format!(" {:>5} {:<wr$} {:<wh$} {}", n.count, n.ranks, n.hosts, n.reason)),
        ]));
    }
    out
}

fn job_line(j: &JobRow) -> String {
    let st = match j.state.as_str() {
        "RUN" => "R",
        "CLEANUP" => "C",
        "SCHED" => "S",
        "PRIORITY" => "P",
        "DEPEND" => "D",
        _ => "N",
    };
    let nested = if j.uri.is_some() { " [instance]" } else { "" };
    format!(
        "{:>12} {:>8} {:<10} {:>2} {:>6} {:>6} {:>7} {}{nested}",
        j.id,
        j.user.chars().take(8).collect::<String>(),
        j.name.chars().take(10).collect::<String>(),
        st,
        j.ntasks,
        j.nnodes,
        fmt_secs(j.secs),
        j.info
    )
}

/// The queue: a header, then each job, the selected one reversed and kept in sight.
fn queue_panel(f: &mut Frame<'_>, area: Rect, m: &Model, ui: &Ui) {
    let mut lines = vec![Line::styled(
        format!(
            "{:>12} {:>8} {:<10} {:>2} {:>6} {:>6} {:>7} INFO",
            "JOBID", "USER", "NAME", "ST", "NTASKS", "NNODES", "TIME"
        ),
        Style::new().add_modifier(Modifier::BOLD),
    )];
    for (i, j) in m.jobs.iter().enumerate() {
        let mut style = Style::new();
        if !j.running() {
            style = style.fg(Color::Yellow);
        }
        if i == ui.selected {
            style = style.add_modifier(Modifier::REVERSED);
        }
        lines.push(Line::styled(job_line(j), style));
    }
    if m.jobs.is_empty() {
        lines.push(Line::from("no active jobs"));
    }
    // Rows inside the border, less the header: scroll so that the selected job stays visible.
    let rows = area.height.saturating_sub(3) as usize;
    let scroll = if rows == 0 { 0 } else { ui.selected.saturating_sub(rows - 1) };
    let title = format!(
        "queue: {} running, {} pending",
        m.jobs.iter().filter(|j| j.running()).count(),
        m.jobs.iter().filter(|j| !j.running()).count()
    );
    let block = Block::new().borders(Borders::ALL).title(format!(" {title} "));
    // The header stays: scroll the rows under it only.
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.height == 0 {
        return;
    }
    let [hdr, rest] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(inner);
    let header = lines.remove(0);
    f.render_widget(Paragraph::new(header), hdr);
    f.render_widget(Paragraph::new(lines).scroll((scroll as u16, 0)), rest);
}

/// One line per verdict, newest first: `  12s ago  lost    3  connection closed  (12 ms)`.
fn verdict_lines(m: &Model, now: f64) -> Vec<Line<'static>> {
    if m.verdicts.is_empty() {
        return vec![Line::from("no lost or torpid verdicts")];
    }
    m.verdicts
        .iter()
        .map(|v| {
            let ago = format!("{:>7} ago ", fmt_secs((now - v.time).max(0.0)));
            let mut rest = format!(" {:<6}", v.ranks);
            if !v.rule.is_empty() {
                rest.push_str(&format!(" {}", v.rule));
            }
            if let Some(l) = v.latency {
                rest.push_str(&format!(" (in {:.0} ms)", l * 1e3));
            }
            Line::from(vec![
                Span::raw(ago),
                Span::styled(format!("{:<7}", v.state), Style::new().fg(health_color(&v.state))),
                Span::raw(rest),
            ])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{draw, Ui, View};
    use crate::cli::top::model::tests::sample;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    /// The screen as text, a line per row.
    fn screen(w: u16, h: u16, ui: &Ui) -> String {
        let mut t = Terminal::new(TestBackend::new(w, h)).expect("terminal");
        t.draw(|f| draw(f, &sample(), ui)).expect("draw");
        let buf = t.backend().buffer().clone();
        (0..h)
            .map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>().trim_end().to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn the_overview_shows_tree_nodes_queue_and_verdicts() {
        let ui = Ui { now: 1000.0, ..Ui::default() };
        let s = screen(120, 24, &ui);
        assert!(s.contains("4 brokers (1 lost, 2 online, 1 torpid)"), "{s}");
        assert!(s.contains("cores 3/6") && s.contains("jobs 1 running, 1 pending"), "{s}");
        assert!(s.contains("0 node0: degraded") && s.contains("└─ 3 node3: lost (connection closed)"), "{s}");
        assert!(s.contains("2 node2: degraded [torpid] (silent 3 s)"), "{s}");
        assert!(s.contains("avail") && s.contains("node[0-1]"), "{s}");
        assert!(s.contains("fRUN1") && s.contains("[instance]"), "{s}");
        assert!(s.contains("fPEND1") && s.contains("resources: needs 4 nodes"), "{s}");
        assert!(s.contains("lost") && s.contains("connection closed (in 12 ms)"), "{s}");
        assert!(s.contains("1.5s ago"), "{s}");
    }

    #[test]
    fn each_view_fills_the_screen_and_descent_shows_the_path() {
        let ui = Ui { view: View::Queue, path: vec!["instance".into(), "fRUN1".into()], ..Ui::default() };
        let s = screen(100, 14, &ui);
        assert!(s.contains("queue: 1 running, 1 pending") && s.contains("instance > fRUN1"), "{s}");
        assert!(s.contains("Esc back") && !s.contains("┌ tree "), "{s}");
        let v = screen(100, 14, &Ui { view: View::Verdicts, ..Ui::default() });
        assert!(v.contains("┌ verdicts ") && !v.contains("┌ queue"), "{v}");
        assert_eq!(View::Verdicts.next(), View::Overview);
    }

    #[test]
    fn a_terminal_too_small_says_so() {
        let s = screen(40, 8, &Ui::default());
        assert!(s.contains("terminal too small (40x8)") && s.contains("60x12"), "{s}");
        assert!(!s.contains("node0"), "{s}");
    }
}
