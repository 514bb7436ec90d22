//! The agreement math of a calibration, pure: no SQL, no wire types.
//!
//! A *subject* is one thing that was labelled pass/fail: a test result's
//! overall verdict, or one evaluator's verdict on a result. It has the
//! automated label and the labels of the human reviewers who gave one.
//!
//! The human label of a subject is the **majority** of its reviewers'
//! labels. A tie (as many passes as fails, or no label at all) is no
//! majority: the subject is left out of every metric that compares the
//! human label with the machine (agreement rate, Cohen's kappa, TPR, TNR,
//! disagreements). It still counts for Fleiss' kappa, which compares the
//! reviewers with each other and needs no majority.
//!
//! A metric that is undefined for the labels at hand (no subject left, a
//! rate whose denominator is zero, a kappa whose chance agreement is 1) is
//! `None`, and `undefined` says why: JSON never sees `NaN`.

use std::collections::BTreeMap;

/// One labelled subject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    /// The automated label: passed.
    pub automated: bool,
    /// Each human reviewer's label (passed), in any order.
    pub human: Vec<bool>,
}

/// The majority of a subject's human labels; `None` on a tie or without
/// labels.
pub fn majority(labels: &[bool]) -> Option<bool> {
    let passes = labels.iter().filter(|&&l| l).count();
    let fails = labels.len() - passes;
    match passes.cmp(&fails) {
        std::cmp::Ordering::Greater => Some(true),
        std::cmp::Ordering::Less => Some(false),
        std::cmp::Ordering::Equal => None,
    }
}

/// Why a metric has no value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undefined(pub String);

/// Cohen's kappa of two raters from their k×k contingency table
/// (`table[i][j]`: subjects rater A put in category i and rater B in j).
pub fn cohens_kappa<const K: usize>(table: &[[u64; K]; K]) -> Result<f64, Undefined> {
    let n: u64 = table.iter().flatten().sum();
    if n == 0 {
        return Err(Undefined("no subject was labelled by both".into()));
    }
    let n = n as f64;
    let observed = (0..K).map(|i| table[i][i] as f64).sum::<f64>() / n;
    let chance = (0..K)
        .map(|i| {
            let row: u64 = table[i].iter().sum();
            let column: u64 = table.iter().map(|r| r[i]).sum();
            (row as f64 / n) * (column as f64 / n)
        })
        .sum::<f64>();
    if (1.0 - chance).abs() < 1e-12 {
        return Err(Undefined("both raters gave every subject the same single label, so chance agreement is 1".into()));
    }
    Ok((observed - chance) / (1.0 - chance))
}

/// Fleiss' kappa from `counts[subject][category]`, the number of raters
/// who put each subject in each category.
///
/// Fleiss (1971) assumes every subject has the same number of raters; a
/// calibration closed early can have fewer on some, so each subject's
/// agreement is computed over its own raters (`P_i = (Σ n_ij² − n_i) /
/// (n_i (n_i − 1))`), and each category's share is the mean of the
/// subjects' own shares (`p_j = mean of n_ij / n_i`), so that every subject
/// weighs the same in `P̄e` as in `P̄` (shares pooled over all ratings let a
/// subject with many raters outweigh one with few, and κ fall below −1);
/// with equal raters both are exactly Fleiss' formula, and κ is always in
/// [−1, 1]. Subjects with fewer than two ratings say nothing about
/// agreement and are left out.
pub fn fleiss_kappa(counts: &[Vec<u64>]) -> Result<f64, Undefined> {
    let rated: Vec<&Vec<u64>> = counts.iter().filter(|c| c.iter().sum::<u64>() >= 2).collect();
    if rated.is_empty() {
        return Err(Undefined("no subject has labels from two reviewers or more".into()));
    }
    let categories = rated.iter().map(|c| c.len()).max().unwrap_or(0);
    let mut p_bar = 0.0;
    for c in &rated {
        let n_i = c.iter().sum::<u64>() as f64;
        let squares = c.iter().map(|&x| (x * x) as f64).sum::<f64>();
        p_bar += (squares - n_i) / (n_i * (n_i - 1.0));
    }
    p_bar /= rated.len() as f64;
    let p_e = (0..categories)
        .map(|j| {
            let p_j =
                rated.iter().map(|c| c.get(j).copied().unwrap_or(0) as f64 / c.iter().sum::<u64>() as f64).sum::<f64>()
                    / rated.len() as f64;
            p_j * p_j
        })
        .sum::<f64>();
    if (1.0 - p_e).abs() < 1e-12 {
        return Err(Undefined("every reviewer gave every subject the same label, so chance agreement is 1".into()));
    }
    Ok((p_bar - p_e) / (1.0 - p_e))
}

/// The metrics of a set of subjects.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    pub agreement_rate: Option<f64>,
    pub cohens_kappa: Option<f64>,
    pub fleiss_kappa: Option<f64>,
    pub true_positive_rate: Option<f64>,
    pub true_negative_rate: Option<f64>,
    /// For each `None` above, by its field name, why.
    pub undefined: BTreeMap<&'static str, String>,
    /// Indexes of the subjects whose human majority differs from the
    /// automated label, with that majority.
    pub disagreements: Vec<(usize, bool)>,
}

/// Every metric of a calibration over `subjects` (see the module's doc for
/// the tie rule).
pub fn evaluate(subjects: &[Subject]) -> Metrics {
    let mut m = Metrics::default();
    // [human][automated], index 0 = pass, 1 = fail.
    let mut table = [[0u64; 2]; 2];
    let mut ties = 0;
    for (i, s) in subjects.iter().enumerate() {
        match majority(&s.human) {
            Some(human) => {
                table[usize::from(!human)][usize::from(!s.automated)] += 1;
                if human != s.automated {
                    m.disagreements.push((i, human));
                }
            }
            None => ties += 1,
        }
    }
    let with_majority: u64 = table.iter().flatten().sum();
    let none_left = || {
        if subjects.is_empty() {
            "nothing was labelled".to_string()
        } else {
            format!("no result has a human majority ({ties} of {} tied or unlabelled)", subjects.len())
        }
    };
    let (tp, fn_, fp, tn) = (table[0][0], table[0][1], table[1][0], table[1][1]);
    let rate =
        |num: u64, den: u64, empty: String| if den == 0 { Err(Undefined(empty)) } else { Ok(num as f64 / den as f64) };
    let agreement = rate(tp + tn, with_majority, none_left());
    let kappa = if with_majority == 0 { Err(Undefined(none_left())) } else { cohens_kappa(&table) };
    let tpr = rate(tp, tp + fn_, "no result has a human-majority pass".into());
    let tnr = rate(tn, tn + fp, "no result has a human-majority fail".into());
    let counts: Vec<Vec<u64>> = subjects
        .iter()
        .map(|s| {
            let passes = s.human.iter().filter(|&&l| l).count() as u64;
            vec![passes, s.human.len() as u64 - passes]
        })
        .collect();
    let fleiss = fleiss_kappa(&counts);
    let mut undefined = BTreeMap::new();
    let mut keep = |name: &'static str, value: Result<f64, Undefined>| {
        value.map_err(|Undefined(reason)| undefined.insert(name, reason)).ok()
    };
    m.agreement_rate = keep("agreement_rate", agreement);
    m.cohens_kappa = keep("cohens_kappa", kappa);
    m.fleiss_kappa = keep("fleiss_kappa", fleiss);
    m.true_positive_rate = keep("true_positive_rate", tpr);
    m.true_negative_rate = keep("true_negative_rate", tnr);
    m.undefined = undefined;
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() < tolerance
    }

    /// The worked example of Wikipedia's "Cohen's kappa" article (section
    /// "Simple example"; the statistic is Cohen, J. (1960), "A coefficient of
    /// agreement for nominal scales", Educational and Psychological
    /// Measurement 20(1)): 50 grant proposals read by two readers, both yes
    /// 20, A yes B no 5, A no B yes 10, both no 15: p_o = 0.7, p_e = 0.5,
    /// κ = 0.4.
    #[test]
    fn cohens_kappa_reproduces_the_grant_proposal_example() {
        let kappa = cohens_kappa(&[[20, 5], [10, 15]]).unwrap();
        assert!(close(kappa, 0.4, 1e-12), "{kappa}");
    }

    /// The same article's pair of examples with equal agreement (60%) but
    /// different marginals: κ = 0.1304 for [[45, 15], [25, 15]] and
    /// κ = 0.2593 for [[25, 35], [5, 35]].
    #[test]
    fn cohens_kappa_reproduces_the_marginals_examples() {
        let a = cohens_kappa(&[[45, 15], [25, 15]]).unwrap();
        let b = cohens_kappa(&[[25, 35], [5, 35]]).unwrap();
        assert!(close(a, 0.1304, 5e-5), "{a}");
        assert!(close(b, 0.2593, 5e-5), "{b}");
    }

    /// The worked example of Wikipedia's "Fleiss' kappa" article (the
    /// statistic is Fleiss, J. L. (1971), "Measuring nominal scale agreement
    /// among many raters", Psychological Bulletin 76(5)): 10 subjects, 14
    /// raters each, 5 categories; P̄ = 0.378, P̄e = 0.213, κ = 0.210.
    #[test]
    fn fleiss_kappa_reproduces_the_fourteen_raters_example() {
        let table: Vec<Vec<u64>> = vec![
            vec![0, 0, 0, 0, 14],
            vec![0, 2, 6, 4, 2],
            vec![0, 0, 3, 5, 6],
            vec![0, 3, 9, 2, 0],
            vec![2, 2, 8, 1, 1],
            vec![7, 7, 0, 0, 0],
            vec![3, 2, 6, 3, 0],
            vec![2, 5, 3, 2, 2],
            vec![6, 5, 2, 1, 0],
            vec![0, 2, 2, 3, 7],
        ];
        let kappa = fleiss_kappa(&table).unwrap();
        assert!(close(kappa, 0.210, 5e-4), "{kappa}");
    }

    /// With two raters and two categories Fleiss' kappa is Scott's pi:
    /// for the Cohen table above, p_o = 0.7 and the pooled shares are
    /// 0.55/0.45, so π = (0.7 − 0.505) / 0.495.
    #[test]
    fn fleiss_kappa_of_two_raters_is_scotts_pi() {
        let mut subjects = Vec::new();
        for (n, row) in [(20, vec![2, 0]), (5, vec![1, 1]), (10, vec![1, 1]), (15, vec![0, 2])] {
            subjects.extend(std::iter::repeat_n(row, n));
        }
        let kappa = fleiss_kappa(&subjects).unwrap();
        assert!(close(kappa, (0.7 - 0.505) / 0.495, 1e-12), "{kappa}");
    }

    /// A calibration closed early: two results labelled fail by all five
    /// reviewers, a third by two who disagree. P_i = 1, 1, 0 → P̄ = 2/3;
    /// each subject's pass share 0, 0, 1/2 → p_pass = 1/6, p_fail = 5/6,
    /// P̄e = 1/36 + 25/36 = 13/18, so κ = (2/3 − 13/18) / (1 − 13/18) = −1/5.
    /// (Shares pooled over all twelve ratings give P̄e = 61/72 and κ =
    /// −13/11, below −1: the few ratings of the third subject weigh as
    /// much as the others' in P̄ but less in P̄e.)
    #[test]
    fn fleiss_kappa_with_unequal_raters_weighs_each_subject_alike() {
        let kappa = fleiss_kappa(&[vec![0, 5], vec![0, 5], vec![1, 1]]).unwrap();
        assert!(close(kappa, -0.2, 1e-12), "{kappa}");
    }

    /// Every table of up to four subjects, each rated by two to six
    /// reviewers: a kappa is in [−1, 1], as the spec says.
    #[test]
    fn fleiss_kappa_stays_within_its_range() {
        let subjects: Vec<Vec<u64>> = (0..=6u64)
            .flat_map(|a| (0..=6u64).map(move |b| vec![a, b]))
            .filter(|c| (2..=6).contains(&(c[0] + c[1])))
            .collect();
        // Every multiset of one to four subjects (indexes not decreasing).
        let mut tables: Vec<Vec<usize>> = (0..subjects.len()).map(|i| vec![i]).collect();
        let mut all = tables.clone();
        for _ in 1..4 {
            tables = tables
                .iter()
                .flat_map(|t| (t[t.len() - 1]..subjects.len()).map(move |i| [t.as_slice(), &[i]].concat()))
                .collect();
            all.extend(tables.iter().cloned());
        }
        let mut checked = 0;
        for table in &all {
            let counts: Vec<Vec<u64>> = table.iter().map(|&i| subjects[i].clone()).collect();
            if let Ok(kappa) = fleiss_kappa(&counts) {
                assert!((-1.0 - 1e-12..=1.0 + 1e-12).contains(&kappa), "{counts:?}: {kappa}");
                checked += 1;
            }
        }
        assert!(checked > 10_000, "{checked}");
    }

    #[test]
    fn degenerate_kappas_are_undefined_with_a_reason() {
        // Every label the same: chance agreement is 1.
        assert!(cohens_kappa(&[[10, 0], [0, 0]]).unwrap_err().0.contains("same single label"));
        assert!(cohens_kappa::<2>(&[[0, 0], [0, 0]]).unwrap_err().0.contains("no subject"));
        assert!(fleiss_kappa(&[vec![3, 0], vec![3, 0]]).unwrap_err().0.contains("same label"));
        assert!(fleiss_kappa(&[vec![1, 0], vec![0, 1]]).unwrap_err().0.contains("two reviewers"));
        assert!(fleiss_kappa(&[]).is_err());
    }

    #[test]
    fn majority_and_ties() {
        assert_eq!(majority(&[true, true, false]), Some(true));
        assert_eq!(majority(&[false, false, true]), Some(false));
        assert_eq!(majority(&[true, false]), None);
        assert_eq!(majority(&[]), None);
    }

    fn s(automated: bool, human: &[bool]) -> Subject {
        Subject { automated, human: human.to_vec() }
    }

    #[test]
    fn evaluate_counts_by_hand() {
        let (p, f) = (true, false);
        let subjects = vec![
            s(p, &[p, p, p]), // agree, pass
            s(p, &[f, f, p]), // disagree: human fail, machine pass
            s(f, &[f, f, f]), // agree, fail
            s(f, &[p, p, f]), // disagree: human pass, machine fail
            s(p, &[p, f]),    // tie: left out
        ];
        let m = evaluate(&subjects);
        // 4 with a majority: tp 1, fn 1, fp 1, tn 1.
        assert_eq!(m.agreement_rate, Some(0.5));
        assert_eq!(m.true_positive_rate, Some(0.5));
        assert_eq!(m.true_negative_rate, Some(0.5));
        // p_o 0.5, p_e 0.5·0.5 + 0.5·0.5 = 0.5 → κ 0.
        assert_eq!(m.cohens_kappa, Some(0.0));
        assert_eq!(m.disagreements, vec![(1, false), (3, true)]);
        // Fleiss over all five: P_i = 1, 1/3, 1, 1/3, 0 → P̄ = 8/15;
        // pass shares 1, 1/3, 0, 2/3, 1/2 → mean 1/2 → P̄e = 0.5² + 0.5²
        // = 0.5, so κ = (8/15 − 1/2) / (1/2) = 1/15.
        let want = 1.0 / 15.0;
        assert!(close(m.fleiss_kappa.unwrap(), want, 1e-12));
        assert!(m.undefined.is_empty(), "{:?}", m.undefined);
    }

    #[test]
    fn evaluate_without_a_majority_or_a_class_is_null_never_nan() {
        let m = evaluate(&[s(true, &[true, false])]);
        for v in [m.agreement_rate, m.cohens_kappa, m.true_positive_rate, m.true_negative_rate] {
            assert_eq!(v, None);
        }
        assert!(m.undefined["agreement_rate"].contains("no result has a human majority"));
        assert!(m.fleiss_kappa.is_some_and(|k| k.is_finite()));

        // Humans and machine always pass: agreement 1, but kappa and TNR
        // undefined.
        let m = evaluate(&[s(true, &[true, true]), s(true, &[true, true])]);
        assert_eq!(m.agreement_rate, Some(1.0));
        assert_eq!(m.true_positive_rate, Some(1.0));
        assert_eq!((m.cohens_kappa, m.true_negative_rate, m.fleiss_kappa), (None, None, None));
        assert_eq!(m.undefined.len(), 3);

        let m = evaluate(&[]);
        assert_eq!(m.undefined["agreement_rate"], "nothing was labelled");
    }
}
