"""Coalition games over heads: values of coalitions, Shapley values and interactions, shapiq estimators."""
