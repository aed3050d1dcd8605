package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// TestPlot: the SVG is well-formed XML with an svg root, one curve per
// target with data, and every label in the legend, escaped.
func TestPlot(t *testing.T) {
	labels := []string{"echo", "redis", "rld", "rld-on-redis <&> (redis table)"}
	var curves []curve
	for i, l := range labels {
		m := fakeMeasurement(10_000, time.Duration(i+1)*time.Microsecond)
		curves = append(curves, curve{label: l, hist: m.hist, dashed: i == 3})
	}
	curves = append(curves, curve{label: "empty", hist: newHist()})
	var buf bytes.Buffer
	if err := writePlot(&buf, "title & more", "subtitle", curves); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	var texts []string
	root, polylines := "", 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, buf.String())
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
				if tok.Name.Space != "http://www.w3.org/2000/svg" {
					t.Errorf("root namespace %q", tok.Name.Space)
				}
			}
			if tok.Name.Local == "polyline" {
				polylines++
			}
		case xml.CharData:
			texts = append(texts, string(tok))
		}
	}
	if root != "svg" {
		t.Errorf("root element %q, want svg", root)
	}
	if polylines != 4 {
		t.Errorf("%d curves, want 4 (the empty one is not drawn)", polylines)
	}
	all := strings.Join(texts, "\n")
	for _, want := range append(labels, "empty", "title & more", "0%", "90%", "99%", "99.9%", "99.99%", "percentile") {
		if !strings.Contains(all, want) {
			t.Errorf("SVG text lacks %q", want)
		}
	}
}

func TestPercentileLabel(t *testing.T) {
	for d, want := range []string{"0%", "90%", "99%", "99.9%", "99.99%", "99.999%"} {
		if got := percentileLabel(d); got != want {
			t.Errorf("percentileLabel(%d) = %q, want %q", d, got, want)
		}
	}
}
