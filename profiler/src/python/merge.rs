//! Python frames into native stacks (the last step of naming a Python sample): each native
//! `_PyEval_EvalFrameDefault` frame stands for one C-level call of the eval loop, which runs
//! one group of Python frames; the group replaces it. Pure, so it is tested on its own.

/// Whether a native function name is the eval loop (or its split-off cold part).
pub(crate) fn is_eval_loop(name: &str) -> bool {
    name == "_PyEval_EvalFrameDefault" || name.starts_with("_PyEval_EvalFrameDefault.")
}

/// `native` root first with `is_eval` per frame; `python` innermost first, each with whether
/// it is the outermost frame of its eval-loop call. Returns the stack root first. Matching
/// starts at the leaf, because a native stack cut short loses its root end: Python groups
/// left over then go above the deepest native frame (at the root end), and eval-loop frames
/// left over (a walk cut short) stay as they are.
pub(crate) fn merge<T: Clone>(native: &[T], is_eval: &[bool], python: &[(T, bool)]) -> Vec<T> {
    let mut groups: Vec<Vec<T>> = Vec::new();
    let mut current = Vec::new();
    for (frame, outermost) in python {
        current.push(frame.clone());
        if *outermost {
            groups.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        groups.push(current);
    }
    let mut out = Vec::with_capacity(native.len() + python.len());
    let mut next = groups.into_iter();
    for (i, frame) in native.iter().enumerate().rev() {
        if is_eval.get(i).copied().unwrap_or(false)
            && let Some(g) = next.next()
        {
            out.extend(g);
        } else {
            out.push(frame.clone());
        }
    }
    for g in next {
        out.extend(g);
    }
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::merge;

    #[test]
    fn each_eval_frame_takes_its_group() {
        // main -> eval(<module> -> a) -> qsort -> eval(cmp -> c) -> leaf
        let native = ["main", "eval", "qsort", "eval", "leaf"];
        let is_eval = [false, true, false, true, false];
        let python = [
            ("c", false),
            ("cmp", true),
            ("a", false),
            ("<module>", true),
        ];
        assert_eq!(
            merge(&native, &is_eval, &python),
            ["main", "<module>", "a", "qsort", "cmp", "c", "leaf"]
        );
    }

    #[test]
    fn cut_native_stack_puts_the_rest_at_the_root() {
        // Only the leaf native frame was unwound (no frame pointers in libpython).
        let native = ["eval"];
        let python = [("c", false), ("b", true), ("a", true), ("<module>", true)];
        assert_eq!(
            merge(&native, &[true], &python),
            ["<module>", "a", "b", "c"]
        );
        assert_eq!(
            merge(&["sha256"], &[false], &python),
            ["<module>", "a", "b", "c", "sha256"]
        );
    }

    #[test]
    fn no_python_frames_leaves_the_native_stack() {
        let native = ["main", "eval", "x"];
        assert_eq!(merge(&native, &[false, true, false], &[]), native);
    }
}
