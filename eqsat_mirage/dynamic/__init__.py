"""Shape families (dynamic sizes): the padded, masked program one search plans
(``padding``), how its plan serves every size (``scale``) and running it (``runner``)."""
