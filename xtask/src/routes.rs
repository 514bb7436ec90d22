//! The overlapping-route bridge.
//!
//! dropshot's router is a trie that refuses two things the spec's paths do:
//! a literal segment beside a variable one at the same depth
//! (`/test-results/by-call/{callId}` beside `/test-results/{id}`), and two
//! names for one variable (`/batch-runs/{batchId}/runs` beside
//! `/batch-runs/{id}`). This module maps every spec path onto a route dropshot
//! accepts: at each trie node where the children clash, all of them become one
//! variable (named after the first variable there), and each route records
//! what its generated endpoint must check (`literals`: this route variable
//! must equal this text) and rename (`renames`: this route variable is that
//! spec parameter) to recover the documented operation. Routes that need
//! neither are passed through unchanged.

use std::collections::BTreeSet;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Literal(String),
    Variable(String),
}

impl Segment {
    fn parse(text: &str) -> Segment {
        match text.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
            Some(name) => Segment::Variable(name.to_string()),
            None => Segment::Literal(text.to_string()),
        }
    }

    fn render(&self) -> String {
        match self {
            Segment::Literal(l) => l.clone(),
            Segment::Variable(v) => format!("{{{v}}}"),
        }
    }
}

/// Where one spec path ends up on dropshot's router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The path as the spec documents it (relative to the base path).
    pub spec_path: String,
    /// The path dropshot routes (relative to the base path).
    pub route_path: String,
    /// `(route variable, literal)`: the request matches only if equal.
    pub literals: Vec<(String, String)>,
    /// `(route variable, spec parameter)` for variables that were renamed.
    pub renames: Vec<(String, String)>,
    /// `(route variable, spec parameter)` for every variable of the spec path
    /// in order, including those that kept their name.
    pub variables: Vec<(String, String)>,
}

impl Route {
    pub fn is_bridged(&self) -> bool {
        !self.literals.is_empty() || !self.renames.is_empty()
    }
}

/// Maps each path (in the order given) to its route.
pub fn bridge(paths: &[String]) -> Vec<Route> {
    let parsed: Vec<Vec<Segment>> = paths
        .iter()
        .map(|p| p.trim_matches('/').split('/').filter(|s| !s.is_empty()).map(Segment::parse).collect())
        .collect();
    let mut out: Vec<Vec<Segment>> = vec![Vec::new(); paths.len()];
    let all: Vec<usize> = (0..paths.len()).collect();
    assign(&parsed, &mut out, &all, 0, &BTreeSet::new());

    paths
        .iter()
        .zip(parsed.iter().zip(out))
        .map(|(spec_path, (original, routed))| {
            let mut literals = Vec::new();
            let mut renames = Vec::new();
            let mut variables = Vec::new();
            for (orig, new) in original.iter().zip(&routed) {
                match (orig, new) {
                    (Segment::Literal(l), Segment::Variable(v)) => literals.push((v.clone(), l.clone())),
                    (Segment::Variable(o), Segment::Variable(v)) => {
                        if o != v {
                            renames.push((v.clone(), o.clone()));
                        }
                        variables.push((v.clone(), o.clone()));
                    }
                    _ => {}
                }
            }
            Route {
                spec_path: spec_path.clone(),
                route_path: format!("/{}", routed.iter().map(Segment::render).collect::<Vec<_>>().join("/")),
                literals,
                renames,
                variables,
            }
        })
        .collect()
}

/// Assigns the segment at `depth` for the routes in `group`, which share the
/// same routed prefix, then recurses into each child.
fn assign(parsed: &[Vec<Segment>], out: &mut [Vec<Segment>], group: &[usize], depth: usize, used: &BTreeSet<String>) {
    let continuing: Vec<usize> = group.iter().copied().filter(|&i| parsed[i].len() > depth).collect();
    if continuing.is_empty() {
        return;
    }
    let mut literals: Vec<&str> = Vec::new();
    let mut variables: Vec<&str> = Vec::new();
    for &i in &continuing {
        match &parsed[i][depth] {
            Segment::Literal(l) => {
                if !literals.contains(&l.as_str()) {
                    literals.push(l)
                }
            }
            Segment::Variable(v) => {
                if !variables.contains(&v.as_str()) {
                    variables.push(v)
                }
            }
        }
    }

    if variables.is_empty() {
        // Only literals here: dropshot holds any number of them side by side.
        for literal in literals {
            let child: Vec<usize> = continuing
                .iter()
                .copied()
                .filter(|&i| parsed[i][depth] == Segment::Literal(literal.to_string()))
                .collect();
            for &i in &child {
                out[i].push(Segment::Literal(literal.to_string()));
            }
            assign(parsed, out, &child, depth + 1, used);
        }
        return;
    }

    // One variable for everything at this depth, named after the variable
    // most routes here already use (the first on a tie), so that the fewest
    // operations are bridged; made unique along the path.
    let uses = |v: &str| continuing.iter().filter(|&&i| parsed[i][depth] == Segment::Variable(v.to_string())).count();
    let base = variables.iter().copied().fold(variables[0], |best, v| if uses(v) > uses(best) { v } else { best });
    let mut name = base.to_string();
    let mut n = 2;
    while used.contains(&name) {
        name = format!("{base}{n}");
        n += 1;
    }
    for &i in &continuing {
        out[i].push(Segment::Variable(name.clone()));
    }
    let mut used = used.clone();
    used.insert(name);
    assign(parsed, out, &continuing, depth + 1, &used);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(paths: &[&str]) -> Vec<Route> {
        bridge(&paths.iter().map(|p| p.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn literal_beside_variable_becomes_checked_variable() {
        let r = routes(&["/test-results/{id}", "/test-results/by-call/{callId}"]);
        assert_eq!(r[0].route_path, "/test-results/{id}");
        assert!(!r[0].is_bridged());
        assert_eq!(r[1].route_path, "/test-results/{id}/{callId}");
        assert_eq!(r[1].literals, vec![("id".to_string(), "by-call".to_string())]);
        assert!(r[1].renames.is_empty());
    }

    #[test]
    fn two_names_for_one_variable_become_a_rename() {
        let r = routes(&["/batch-runs/{batchId}/runs", "/batch-runs/{id}", "/batch-runs/{id}/cancel"]);
        assert_eq!(r[0].route_path, "/batch-runs/{id}/runs");
        assert_eq!(r[0].renames, vec![("id".to_string(), "batchId".to_string())]);
        assert_eq!(r[1].route_path, "/batch-runs/{id}");
        assert!(!r[1].is_bridged());
    }

    #[test]
    fn names_stay_unique_along_a_path() {
        let r = routes(&["/reviews/{id}", "/reviews/calibration/{id}", "/reviews/reviewers"]);
        assert_eq!(r[1].route_path, "/reviews/{id}/{id2}");
        assert_eq!(r[1].literals, vec![("id".to_string(), "calibration".to_string())]);
        assert_eq!(r[1].renames, vec![("id2".to_string(), "id".to_string())]);
        assert_eq!(r[2].route_path, "/reviews/{id}");
    }

    #[test]
    fn paths_without_clashes_pass_through() {
        let r = routes(&["/api-keys", "/api-keys/{id}", "/api-keys/{id}/rotate", "/queue/stats"]);
        assert!(r.iter().all(|r| !r.is_bridged() && r.route_path == r.spec_path));
    }
}
