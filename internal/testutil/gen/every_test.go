package gen

import (
	"reflect"
	"testing"
)

type Inner struct {
	Count int32
	Note  string
}

type filled struct {
	Name string
	Inner
	Nested Inner
	Bytes  int64
	Rate   float64
	Ok     bool
	hidden int
}

// Every sets each exported field, the embedded and nested ones too, to a value of its own, and
// leaves the unexported ones.
func TestEveryFieldIsSet(t *testing.T) {
	got := Every[filled]()
	want := filled{Name: "Name", Inner: Inner{Count: 2, Note: "Note"}, Nested: Inner{Count: 4, Note: "Note"}, Bytes: 6, Rate: 7, Ok: true, hidden: 0}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Every = %+v, want %+v", got, want)
	}
	defer func() {
		if recover() == nil {
			t.Error("Every of a struct with a pointer field did not panic")
		}
	}()
	Every[struct{ P *int }]()
}
