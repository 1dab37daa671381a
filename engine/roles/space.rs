//! A template's perturbation space as the level space of `actors`: one dimension per entry
//! (off, then each combination of its list parameters), a cost per fault and per setting,
//! a budget, and a level's plan.

use super::RolesError;
use crate::instance::Plan;
use crate::template::{Settings, Template};
use actors::msg::Level;
use actors::space::{Dimension, LevelSpace};
use std::collections::BTreeMap;

/// How the space is priced and which task seeds it draws.
#[derive(Debug, Clone, PartialEq)]
pub struct SpaceSettings {
    /// Cost per fault name (`disk-fill`) or per setting (`disk-fill(free_pct=5)`); 1 when
    /// not given. A setting's own cost wins over its fault's.
    pub costs: BTreeMap<String, f64>,
    pub budget: f64,
    /// At most this many faults on at once.
    pub max_faults: usize,
    pub seed_base: u64,
    pub seed_count: u64,
}

/// The level space of a template, and the template to make plans.
#[derive(Debug, Clone)]
pub struct FaultSpace {
    pub template: Template,
    pub space: LevelSpace,
    /// The template's settings, computed once (a plan is made at every reset).
    settings: Vec<Settings>,
}

impl FaultSpace {
    pub fn new(template: Template, s: &SpaceSettings) -> Result<Self, RolesError> {
        if template.task.is_none() {
            return Err(RolesError::NoTask {
                template: template.file.display().to_string(),
            });
        }
        let settings = template.settings();
        let mut known = std::collections::BTreeSet::new();
        let mut dims = Vec::with_capacity(settings.len());
        for (name, choices) in &settings {
            known.insert(name.clone());
            let base = s.costs.get(name).copied().unwrap_or(1.0);
            let mut labels = vec!["off".to_string()];
            let mut cost = vec![0.0];
            for (label, _) in choices {
                let key = format!("{name}({label})");
                known.insert(key.clone());
                let c = s.costs.get(&key).copied().unwrap_or(base);
                labels.push(label.clone());
                cost.push(c);
            }
            dims.push(Dimension {
                name: name.clone(),
                allowed: vec![true; labels.len()],
                labels,
                cost,
            });
        }
        for (k, &c) in &s.costs {
            if !known.contains(k) {
                return Err(RolesError::Cost {
                    key: k.clone(),
                    reason: format!(
                        "no such fault or setting in {}; they are: {}",
                        template.file.display(),
                        known.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                });
            }
            if !(c.is_finite() && c > 0.0) {
                return Err(RolesError::Cost {
                    key: k.clone(),
                    reason: format!("is {c}; must be a finite number > 0"),
                });
            }
        }
        let space = LevelSpace::new(dims, s.budget, s.seed_base, s.seed_count)?
            .with_max_active(s.max_faults);
        Ok(Self {
            template,
            space,
            settings,
        })
    }

    /// The plan of a level.
    pub fn plan(&self, level: &Level) -> Plan {
        self.template
            .plan_with(&self.settings, level.seed, &level.choices)
    }

    /// Mask `(dimension, choice)` off (a fault that does not apply, or that the catalogue
    /// cannot recover from).
    pub fn forbid(&mut self, dim: usize, choice: usize) {
        if let Some(a) = self
            .space
            .dims
            .get_mut(dim)
            .and_then(|d| d.allowed.get_mut(choice))
        {
            if choice != 0 {
                *a = false;
            }
        }
    }
}
