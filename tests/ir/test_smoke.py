import eqsat_mirage as em


def test_import():
    assert em.Graph("x").name == "x"
